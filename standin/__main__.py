from standin.cli import main

main()
