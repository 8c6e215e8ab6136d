-- NEXMark q0, pass-through: every bid as it is (measures the engine's bare cost).
SELECT auction, bidder, price, date_time, extra FROM bid
