"""The models the conformance suite trains: the matrix's MLP and its training steps
(``common``), the zoo of further models (``zoo``, ``transformer``) and the small FSDP1 models of
upstream's own test cases (``fsdp1_small``)."""
