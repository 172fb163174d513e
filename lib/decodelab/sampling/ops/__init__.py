"""The sampler's fast routes (`method="fast"`): single-pass top-k, top-p by rejection, and the routing between
them. Each reaches the reference processors' distribution and is tested against it."""
