# The model server's part as it imports it (from the script's own directory) is roles/serving/files.
from roles.serving.files.provisioner_serve_app import *
from roles.serving.files.provisioner_serve_app import _no_constant as _no_constant
