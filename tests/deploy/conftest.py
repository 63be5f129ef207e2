"""Makes this directory's helper modules (deploy_helpers, server_facts)
importable however pytest is started."""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
