"""`python -m scripted_model --port N`: serve until interrupted."""

from scripted_model.server import main

if __name__ == "__main__":
    main()
