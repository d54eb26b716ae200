"""CUDA shared memory, answered as Triton built without GPUs answers it.

reactantserver serves *system* shared memory (:mod:`reactantserver.shm`) and no CUDA IPC
regions: a worker's device memory belongs to its weight cache and its executions, and a
client's ``cudaIpcMemHandle`` would pin a region of it outside the budget. Triton's own
clients nevertheless call ``unregister_cuda_shared_memory()`` (and read the status) as a
*reset* before they register system regions -- ``simple_grpc_shm_client``,
``simple_grpc_shm_string_client``, ``reuse_infer_objects_client`` -- and a Triton server
built without GPU support answers those calls: no regions, and nothing to unregister.
So do we, in the worker and the gateway alike; only a registration is refused:

======================================  ==============================================
``CudaSharedMemoryStatus``              every region: an empty list; a named region:
                                        NOT_FOUND (none is ever registered)
``CudaSharedMemoryUnregister``          OK, whether named or not (there is nothing to
                                        unregister, which is what a reset asks for)
``CudaSharedMemoryRegister``            INVALID_ARGUMENT, Triton's words ("GPUs not
                                        supported") and what to do instead
======================================  ==============================================

No I/O, no state, no JAX: the answers are the same wherever they are given.
"""

from __future__ import annotations

from typing import NoReturn

from .errors import InvalidArgument, NotFound
from .protocol import inference as pb

__all__ = ["cuda_register", "cuda_status", "cuda_unregister"]

#: Characters of a client's region name repeated in a refusal at most.
_ECHO = 64


def _name(name: str) -> str:
    return repr(name if len(name) <= _ECHO else name[:_ECHO] + "...")


def cuda_status(name: str) -> pb.CudaSharedMemoryStatusResponse:
    """CudaSharedMemoryStatus: no regions; NOT_FOUND for a named one."""
    if name:
        raise NotFound(
            f"CUDA shared memory region {_name(name)} is not registered: this server "
            "registers no CUDA shared memory (SystemSharedMemoryStatus lists the system "
            "regions)"
        )
    return pb.CudaSharedMemoryStatusResponse()


def cuda_unregister(name: str) -> pb.CudaSharedMemoryUnregisterResponse:
    """CudaSharedMemoryUnregister: OK -- no CUDA region is registered, named or not."""
    del name  # every name is already unregistered
    return pb.CudaSharedMemoryUnregisterResponse()


def cuda_register(name: str) -> NoReturn:
    """CudaSharedMemoryRegister: refused, saying what to use instead."""
    raise InvalidArgument(
        f"failed to register CUDA shared memory region {_name(name)}, GPUs not supported: "
        "reactantserver does not serve CUDA shared memory; register system shared memory "
        "(SystemSharedMemoryRegister) or send tensors inline"
    )
