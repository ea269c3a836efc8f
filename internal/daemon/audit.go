package daemon

import (
	"encoding/json"
	"fmt"
	"os"
	"sync"
)

// appendAudit appends rec as one JSON line to the audit file at path (the
// shield's and the BGP speaker's, in the state directory). A line that
// would take the file past max bytes first rotates it to path.1 (one
// generation kept). mu serializes the writers of one file. rotateErr is a
// failed rotation (the line is still appended); err, a line not written.
func appendAudit(mu *sync.Mutex, path string, max int64, rec any) (rotateErr, err error) {
	line, err := json.Marshal(rec)
	if err != nil {
		return nil, fmt.Errorf("encode the audit record: %w", err)
	}
	line = append(line, '\n')
	mu.Lock()
	defer mu.Unlock()
	if fi, err := os.Stat(path); err == nil && fi.Size()+int64(len(line)) > max {
		if err := os.Rename(path, path+".1"); err != nil {
			rotateErr = fmt.Errorf("rotate the audit file: %w", err)
		}
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return rotateErr, err
	}
	_, err = f.Write(line)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return rotateErr, err
}
