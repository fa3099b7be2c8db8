from tests.standin.cli import main

main()
