"""What a member of an averaging group is, Ray-free: a learner's id (``ids``), the typed errors the
averager answers its members with (``errors``) and the members' retry schedule for an averager that is
restarting (``retry``). The folder sits below ``rounds/``, ``dataplane/`` and ``runtime/``, which all use
these names: it imports nothing from them (nor from any other folder of the package) and no ray, so any
of them may import it without an arrow back up."""
