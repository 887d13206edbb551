from w4cli.entry import main

main()
