"""Storage: path I/O on local disks and Cloud Storage (``gs://``), the storage
client setup, appends to objects, and the package's one lock.
"""
