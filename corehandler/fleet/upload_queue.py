"""Where corehandler/cli/install.py and corehandler/host/overview.py still read the upload queue from; the queue's
table is the store's (store/upload_queue.py). To go once they import corehandler.store.upload_queue."""

from corehandler.store.upload_queue import stats, status_line  # noqa: F401
