# The module as Ansible loads it (ansible.cfg module_utils, or the installed collection) is plugins/module_utils.
from plugins.module_utils.provisioner_storage_layouts import *
