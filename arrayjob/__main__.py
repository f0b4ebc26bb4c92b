"""``python -m arrayjob``: the ``arrayjob`` command where only the package is present (a Ray
job's uploaded ``py_modules``, see ``arrayjob submit --upload-package``)."""

from arrayjob.cli.main import entry_point

entry_point()
