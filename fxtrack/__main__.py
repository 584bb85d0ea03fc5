from fxtrack.cli import main

main()
