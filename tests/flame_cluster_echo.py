"""A tiny Flame service for the real-cluster test: echoes its input behind the executor id and GPU pin.

The prefix lets the test join a task to `list_executors()` and check the per-application
CUDA_VISIBLE_DEVICES reached the process the executor manager spawned.
"""

import os

import flamepy


class EchoService(flamepy.FlameService):
    def on_session_enter(self, context):
        return True

    def on_task_invoke(self, context):
        endpoint = os.environ.get(flamepy.FLAME_INSTANCE_ENDPOINT, "")
        executor_id = os.path.basename(endpoint).removesuffix(".sock")
        gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        return f"{executor_id}:{gpu}:".encode() + (context.input or b"")

    def on_session_leave(self):
        return True


if __name__ == "__main__":
    flamepy.run(EchoService())
