package ferrychain

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/ferry-dev/ferry/ferrydriver"
)

// CursorInfo is a source's saved position, for status displays.
type CursorInfo struct {
	Name    string      `json:"name"`
	ChainID uint64      `json:"chain_id"`
	Tier    string      `json:"tier"`
	Block   uint64      `json:"block"`
	Hash    common.Hash `json:"hash"`
	Window  int         `json:"window_blocks"`
	Reorgs  uint64      `json:"reorgs"`
	SavedAt time.Time   `json:"saved_at"`
	Holder  string      `json:"lease_holder,omitempty"`
	Held    bool        `json:"lease_held"`
}

// ReadCursor reads the saved cursor of the source named name (the consumer
// group, unless Config.Name says otherwise). A source that never ran has a
// zero Block.
func ReadCursor(ctx context.Context, store ferrydriver.Store, name string) (*CursorInfo, error) {
	feed := "chain/" + name
	cp, err := store.LoadCheckpoint(ctx, feed)
	if err != nil {
		return nil, err
	}
	info := &CursorInfo{Name: feed, SavedAt: cp.UpdatedAt}
	if len(cp.Cursor) > 0 {
		var cur cursor
		if err := json.Unmarshal(cp.Cursor, &cur); err != nil {
			return nil, fmt.Errorf("ferrychain: the checkpoint %s is not a chain cursor: %w", feed, err)
		}
		info.ChainID, info.Tier, info.Reorgs, info.Window = cur.ChainID, cur.Tier, cur.Reorgs, len(cur.Window)
		if last, ok := cur.last(); ok {
			info.Block, info.Hash = last.Number, last.Hash
		}
	}
	l, err := store.GetLease(ctx, feed)
	switch {
	case err == nil:
		info.Holder, info.Held = l.Holder, l.ExpiresAt.After(l.Now)
	case !errors.Is(err, ferrydriver.ErrNotFound):
		return nil, err
	}
	return info, nil
}
