"""An independent oracle of the semantics of torch's distributed state-dict code."""
