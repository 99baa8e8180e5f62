"""One executor per runtime library (ONNX Runtime, OpenVINO, torch), shared by the backends.

Only executors build runtime sessions: an ONNX Runtime ``InferenceSession`` with its execution
provider, an OpenVINO compiled model on its device, a torch module on its device. Backends
(npu, cuda, rocm) own discovery, telemetry and memory accounting and call these for
execution; model plugins never see a session, only the runner the engine binds to a device.
Each runtime library is imported inside its executor, never at package import.
"""

__all__: list[str] = []
