"""One module per subcommand: options in, library calls, rendering out."""
