"""The MPSGraph backend: all decisions in Python, a mechanical native replay on Apple.

``selectors`` (the selector/descriptor table shared with ``native/mpsgraph``) and ``program``
(the recorded-program format and the recording builder) are pure data; see
docs/backend-mpsgraph.md.
"""
