"""`w4 verify`: the release gate. One module per job:

    report.py       Check rows, the exit decision, table / JSON / JUnit rendering
    environment.py  GPU and kernel probe, the environment block of the report
    selftest.py     `w4 verify`: kernels and references over a fixed shape matrix
    integrity.py    `w4 verify MODEL`: one quantized checkpoint, alone
    compare.py      `w4 verify OUTPUT --against SOURCE`: a conversion against a fresh one
"""
