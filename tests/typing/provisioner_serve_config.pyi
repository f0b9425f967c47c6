# The model server's part as it imports it (from the script's own directory) is roles/serving/files.
from roles.serving.files.provisioner_serve_config import *
from roles.serving.files.provisioner_serve_config import _NUMBERS as _NUMBERS
from roles.serving.files.provisioner_serve_config import _int as _int
from roles.serving.files.provisioner_serve_config import _version_key as _version_key
