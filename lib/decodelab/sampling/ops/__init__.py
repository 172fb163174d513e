"""The sampler's fast routes (`method="fast"`): single-pass top-k, top-p by rejection, and the routing between
them. Each reaches the reference processors' distribution and is tested against it. `exponential` makes seeded rows'
Exponential noise on the CPU faster, the same numbers as `exponential_`, whatever the method."""
