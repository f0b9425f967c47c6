# The model server's part as it imports it (from the script's own directory) is roles/serving/files.
from roles.serving.files.provisioner_serve_engines import *
