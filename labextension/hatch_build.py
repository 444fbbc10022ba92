"""The wheel's platform part: scripts/build-wheels.sh sets
GPUMEM_WHEEL_BINARY (the gpumem binary built for one architecture) and
GPUMEM_WHEEL_PLATFORM (its platform tag, e.g. linux_x86_64, which
auditwheel then checks and turns into manylinux). The binary goes into the
wheel's scripts, so that pip puts `gpumem` on PATH in the environment it
installs into. Without them the wheel is pure Python (the extension's own
tests build the daemon with go)."""

import os

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class GpumemBinaryHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version, build_data):
        if self.target_name != "wheel":
            return
        binary = os.environ.get("GPUMEM_WHEEL_BINARY", "")
        if not binary:
            return
        platform = os.environ.get("GPUMEM_WHEEL_PLATFORM", "")
        if not platform:
            raise ValueError("GPUMEM_WHEEL_BINARY is set but GPUMEM_WHEEL_PLATFORM is not: say which platform the binary is for")
        if not os.access(binary, os.X_OK):
            raise ValueError(f"GPUMEM_WHEEL_BINARY={binary} is not an executable file")
        build_data["pure_python"] = False
        build_data["tag"] = f"py3-none-{platform}"
        build_data["shared_scripts"][binary] = "gpumem"
