"""One module per `inferchain` subcommand, each with `register(subparsers)`."""
