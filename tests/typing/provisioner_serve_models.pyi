# The model server's part as it imports it (from the script's own directory) is roles/serving/files.
from roles.serving.files.provisioner_serve_models import *
from roles.serving.files.provisioner_serve_models import _PAGE as _PAGE
from roles.serving.files.provisioner_serve_models import _load_catboost as _load_catboost
from roles.serving.files.provisioner_serve_models import _load_lightgbm as _load_lightgbm
from roles.serving.files.provisioner_serve_models import _load_sklearn as _load_sklearn
from roles.serving.files.provisioner_serve_models import _load_torchscript as _load_torchscript
from roles.serving.files.provisioner_serve_models import _load_xgboost as _load_xgboost
from roles.serving.files.provisioner_serve_models import _size as _size
from roles.serving.files.provisioner_serve_models import _some as _some
from roles.serving.files.provisioner_serve_models import _xgboost_dense_predict as _xgboost_dense_predict
