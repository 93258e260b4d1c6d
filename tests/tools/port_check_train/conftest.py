"""One torch thread for these tests' tiny models: a second thread of torch's pool only waits for
the other at every operation, most of all on a busy machine; restored after each test."""

import pytest
import torch


@pytest.fixture(autouse=True)
def one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
