"""The models the conformance suite trains and how it trains them: the matrix's MLP and its
training steps (``common``), the optimizer recipes (``optimizers``), the zoo of further models
(``zoo``, ``transformer``, ``experts``), the memory checks' model (``sized``) and the small
FSDP1 models of upstream's own test cases (``fsdp1_small``)."""
