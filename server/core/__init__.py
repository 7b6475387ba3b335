"""The evaluation's domain: one evaluation as a state machine (``evaluation``, with its
``endings`` and ``restarts``), its budgets and time bank, the client gate, where a resumed
evaluation continues, the competition file, the generic scoring helpers and the summary.

Nothing here waits on Redis or a socket: the service (``server/service``) feeds it requests and
expired deadlines, and hands it the results store it writes each finished item to.
"""
