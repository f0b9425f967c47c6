"""Cases for the code that reads the kernel's sysfs files, shared by the tests of each reader of
the same file: the facts module (plugins/modules/provisioner_facts.py) and the status script
(roles/shared/files/provisioner_status) are deployed apart, so each has its own parser."""

from __future__ import annotations

# A selection file (transparent_hugepage/enabled, .../defrag): its text -> the word in brackets.
BRACKETED = [
    ("always [madvise] never", "madvise"),
    ("always [madvise] never\n", "madvise"),
    ("[always] madvise never", "always"),
    ("[always] madvise never\n", "always"),
    ("always defer defer+madvise [madvise] never", "madvise"),
    ("always defer [defer+madvise] madvise never", "defer+madvise"),
    ("", None),
]
