from aggregator.cli import main

main()
