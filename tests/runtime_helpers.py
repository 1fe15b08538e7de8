"""Shared by several test modules (moved out of tests/test_runtime.py, which uses them too): STANDIN_TORCH."""


STANDIN_TORCH = {  # enough of torch for the install's probe and the start's check: it imports, says what it
    # is and adds 1 + 1 (but the engine cannot run on it: the tests that start the app on a runtime use a real wheel)
    "torch/__init__.py": "__version__ = '2.13.0+cu999'\n"
                         "class version:\n    cuda = '99.9'\n"
                         "class cuda:\n    @staticmethod\n    def is_available():\n        return False\n"
                         "class Tensor(list):\n    def sum(self):\n        return Tensor([sum(self)])\n"
                         "    def __float__(self):\n        return float(self[0])\n"
                         "def ones(n):\n    return Tensor([1.0] * n)\n"
                         "float16 = bfloat16 = float32 = nn = None\n",
}

