from aggregator.cli.main import main

main()
