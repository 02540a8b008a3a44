"""`python -m scripted_model --port N`: serve until interrupted (options: `server.add_server_arguments`)."""

import argparse

from scripted_model.server import add_server_arguments, serve_from_arguments


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m scripted_model", description="Deterministic OpenAI-compatible scripted model server."
    )
    add_server_arguments(parser)
    serve_from_arguments(vars(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
