"""etcd-backed tests: each test gets its own real etcd (see tests/support/etcd.py)."""

from etcd_process import etcd_server as etcd_server
