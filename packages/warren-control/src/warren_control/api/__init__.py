"""The API: sandboxes as the product sees them, behind the edge's identity stamp.

Every /v1 route depends on a verified stamp (identity.require_identity) and reads or writes
only inside the stamped organization: a sandbox id of another organization is simply not
found, exactly like an id nobody ever had. Records live in the database (store.py); the
cluster holds one Sandbox resource per live sandbox, named by the record's internal object
name, which no response ever shows (nor a pod, container, namespace or node name).

A request the deployment cannot carry out exactly is refused with 400
``unsupported_capability`` naming what is missing, never weakened in silence: a GPU where
there is none, memory capture where it is off, a runtime other than gVisor, and anything
that needs a workspace (size or template, fork, stop) where the deployment has no workspace
layer.

Errors are ``{"error": code, "message": text}``.

The parts: ``app`` (the app, its error handlers, the OpenAPI document), ``service`` (what the
routes do, apart from HTTP), ``shapes`` (requests and responses), ``params`` (the stamped
identity and other route parameters), ``errors``, ``cluster`` (Sandbox resources and pods),
and one router per surface: ``sandboxes`` (the /v1 lifecycle), ``sandbox_io`` (exec, files,
the workspace proof) and ``e2b`` (the E2B-compatible routes). Import each from its module:
this one imports nothing, so the SDK can use ``shapes`` without the server.
"""
