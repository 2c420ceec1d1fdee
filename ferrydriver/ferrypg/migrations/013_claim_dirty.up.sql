-- A claimed key whose queue changed below its claim's end while the claim
-- ran: a row committed inside the claim's range after the claim read it (a
-- delivery whose position was taken before the claim's rows but which
-- committed after), a redrive, a discard, a change of the group's dead
-- policy. The claim's finish cannot tell what the worker saw from what it
-- did not, so it moves the key back to where the claim began and makes it
-- runnable: the next claim reads the queue as it is now, under the policy
-- in force (its finished rows are passed over).
ALTER TABLE {schema}.inbox_keys ADD COLUMN claim_dirty boolean NOT NULL DEFAULT false;
