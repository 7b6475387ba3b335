"""The I/O around one evaluation: the request loop (``loop``), the Redis transport, the results
folder and progress events, shared frames for large observations, the participant's Redis ACL,
and ``build``, which assembles an evaluator from a competition file.
"""
