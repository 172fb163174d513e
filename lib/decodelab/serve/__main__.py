"""`python -m decodelab.serve --model tiny-zh`: the OpenAI-compatible server (decodelab.serve.app)."""
from decodelab.serve.app import main

main()
