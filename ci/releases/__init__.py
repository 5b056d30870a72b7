"""The release map: the gate run on several torch releases, and a release x known-divergence
table of what showed where (``python -m ci.releases``)."""
