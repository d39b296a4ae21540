"""The wire schemas, generated from the ``.proto`` files beside them (``make proto``).

Public and neutral: the server (``serving``) and the clients (``bench``, ``scaling``, tests)
import the same messages. ``grpc_service`` is KServe's Open Inference Protocol v2 service;
``redline_v1`` is redline's own entity prediction service.
"""
