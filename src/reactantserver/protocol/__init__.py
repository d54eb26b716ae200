"""Wire protocol: generated message classes, service stubs and the reflection answerer.

Layout
------
The packages below (``inference/``, ``reactant_control/``, ``grpc/``) are generated from
``proto/*.proto`` by ``proto/generate.py`` (run ``nox -s proto`` after editing a ``.proto`` file, then commit
the result; ``tests/test_proto.py`` fails while the committed output is stale).

``inference/``
    Package ``inference`` (``proto/inference.proto`` + ``proto/model_config.proto``): the
    KServe V2 / Triton ``GRPCInferenceService``, wire compatible with Triton's
    ``grpc_service.proto``. Messages are betterproto dataclasses; nested messages are
    flattened by betterproto (``ModelInferRequest.InferInputTensor`` is
    ``ModelInferRequestInferInputTensor``); the grpclib client stub is
    ``GrpcInferenceServiceStub`` and the server base ``GrpcInferenceServiceBase``.
``reactant_control/``
    Package ``reactant_control`` (``proto/reactant_control.proto``): the worker control
    plane, ``ControlServiceStub`` / ``ControlServiceBase``. Enum values lose their enum-name
    prefix (``Residency.RESIDENCY_UNSPECIFIED`` is ``Residency.UNSPECIFIED``).
``grpc/reflection/v1alpha/``, ``grpc/reflection/v1/``, ``grpc/health/v1/``
    gRPC server reflection (``proto/grpc/reflection/*/reflection.proto``) and health
    checking (``proto/grpc/health/v1/health.proto``).
``descriptors.bin``
    Serialized ``FileDescriptorSet`` of every file above, with source comments, served by
    reflection.
The hand-written modules:

``reflection.py``
    :class:`~reactantserver.protocol.reflection.ReflectionAnswerer`, the sans-IO reflection
    logic.
``codec.py``
    The ModelInfer wire codec: request bytes in, response bytes out, no message objects.
``wire_reader.py``
    A cursor over protobuf's wire format: the one reader of the hand-written codecs.
``screen.py``
    Every request but ModelInfer, decoded with bounded work: screened by our reader first.

Nothing is re-exported here: import the generated module you need, e.g.
``from reactantserver.protocol import inference``. The generated modules import betterproto
and grpclib but never JAX.
"""
