"""model.h's counter-based RNG transcribed to Python, for tests that predict the engine's draws
(sampling) and its random weights (init_random): splitmix64 and uniform01(seed, step)."""

MASK64 = (1 << 64) - 1


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def uniform01(seed, step):
    """The draw for (seed, step): 24 random bits of the mixed counter, in [0, 1)."""
    return (splitmix64(splitmix64(seed) ^ ((step * 0xD1B54A32D192ED03) & MASK64)) >> 40) / 2**24
