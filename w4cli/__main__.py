from w4cli.cli import main

main()
