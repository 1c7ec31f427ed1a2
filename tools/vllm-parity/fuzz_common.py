"""What the random searches (fuzz_v0.py, fuzz_pulled.py) share: small random workloads."""


def random_rows(rnd, online_share):
    """2-14 requests (I 1-96, O 1-24), all at 0 or, with probability `online_share`,
    arriving as a Poisson process of mean gap 5 ms: [(arrival, I, O)], and the most tokens
    one request holds (I + O)."""
    n = rnd.randint(2, 14)
    online = rnd.random() < online_share
    rows, t = [], 0.0
    for _ in range(n):
        if online:
            t += rnd.expovariate(1 / 0.005)
        rows.append((round(t, 6), rnd.randint(1, 96), rnd.randint(1, 24)))
    return rows, max(I + O for _, I, O in rows)
