-- NEXMark q3, local item suggestion: who sells in category 10 from Oregon,
-- Idaho or California, and which auctions. An unbounded stream join: its
-- state is never closed by a window, so results appear at the end of a
-- bounded run.
SELECT p.name, p.city, p.state, a.id
FROM auction a JOIN person p ON a.seller = p.id
WHERE a.category = 10 AND p.state IN ('OR', 'ID', 'CA')
