"""A tiny Flame service for the stand-in tests: its replies show which process and executor ran a task.

Commands (the task input): `fail` raises; `sleep:<s>` sleeps and returns its start and end times;
`out:<n>` returns n bytes; `size:...` returns the input's length; `env:<NAME>` returns that
variable; `common` returns the session's common data; anything else is echoed. Common data
`fail-enter` makes on_session_enter raise.
"""

import os
import time

import flamepy


class EchoService(flamepy.FlameService):
    def __init__(self):
        self.common = None

    def on_session_enter(self, context):
        self.common = context.common_data()
        if self.common == b"fail-enter":
            raise RuntimeError("refusing to enter the session")

    def on_task_invoke(self, context):
        data = context.input or b""
        executor_id = os.path.basename(os.environ[flamepy.FLAME_INSTANCE_ENDPOINT]).removesuffix(".sock")
        prefix = f"{os.getpid()}:{executor_id}:".encode()
        if data == b"fail":
            raise RuntimeError("asked to fail")
        if data.startswith(b"sleep:"):
            start = time.time()
            time.sleep(float(data[6:]))
            return prefix + f"{start}:{time.time()}".encode()
        if data.startswith(b"out:"):
            return b"x" * int(data[4:])
        if data.startswith(b"size:"):
            return prefix + str(len(data)).encode()
        if data.startswith(b"env:"):
            return prefix + os.environ.get(data[4:].decode(), "").encode()
        if data == b"common":
            return prefix + (self.common or b"")
        return prefix + data

    def on_session_leave(self):
        pass


if __name__ == "__main__":
    flamepy.run(EchoService())
