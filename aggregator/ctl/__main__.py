from aggregator.ctl.main import main

main()
