"""Building blocks shared by every model family: dense and embedding layers, norms, positions,
attention, feed-forward and Mixture-of-Experts blocks, and layer stacking (remat, scan).

Nothing here knows a family or the mesh: parameters carry logical axis names only.
"""
