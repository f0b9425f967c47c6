# The model server's part as it imports it (from the script's own directory) is roles/serving/files.
from roles.serving.files.provisioner_serve_process import *
from roles.serving.files.provisioner_serve_process import _uvicorn_server as _uvicorn_server
