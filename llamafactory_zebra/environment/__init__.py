"""The machine a run starts on: software-stack checks (``doctor``) and the ROCm settings AMD recommends."""
