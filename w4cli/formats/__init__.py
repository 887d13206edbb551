"""One module per weight layout: its constants, validation, packing and reference math; and fusion of layers."""
