// Package results keeps benchmark runs in an SQLite file (modernc.org/sqlite,
// pure Go), so that runs can be listed, shown again and compared later.
package results

import (
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nsfleet/nsfleet/bench"
	_ "modernc.org/sqlite" // database/sql driver "sqlite", pure Go
)

// DefaultDB is where results are kept unless --db says otherwise:
// $XDG_DATA_HOME/nsfleet/bench.db, or ~/.local/share/nsfleet/bench.db.
func DefaultDB() string {
	dir := os.Getenv("XDG_DATA_HOME")
	if dir == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			home = "/root"
		}
		dir = filepath.Join(home, ".local", "share")
	}
	return filepath.Join(dir, "nsfleet", "bench.db")
}

// Store keeps runs in an SQLite file.
type Store struct {
	db   *sql.DB
	Path string
}

const schema = `
CREATE TABLE IF NOT EXISTS runs (
	id TEXT PRIMARY KEY, scenario TEXT NOT NULL, started TEXT NOT NULL, elapsed REAL,
	params TEXT, env TEXT, keys TEXT, skipped TEXT, notes TEXT);
CREATE TABLE IF NOT EXISTS samples (
	run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
	config TEXT NOT NULL, metric TEXT NOT NULL, unit TEXT, better TEXT,
	mark INTEGER, rep INTEGER, value REAL);
CREATE INDEX IF NOT EXISTS samples_run ON samples(run_id);`

// OpenStore opens (creating) the database at path.
func Open(path string) (*Store, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("results store %s: %w", path, err)
	}
	db, err := sql.Open("sqlite", path)
	if err != nil {
		return nil, fmt.Errorf("results store %s: %w", path, err)
	}
	if _, err := db.Exec(schema); err != nil {
		db.Close()
		return nil, fmt.Errorf("results store %s: %w", path, err)
	}
	return &Store{db: db, Path: path}, nil
}

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

func js(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// Save stores a run and its samples in one transaction.
func (s *Store) Save(r *bench.Run) error {
	tx, err := s.db.Begin()
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.Exec(`INSERT INTO runs VALUES (?,?,?,?,?,?,?,?,?)`, r.ID, r.Scenario, r.Started.Format(time.RFC3339Nano), r.Elapsed,
		js(r.Params), js(r.Env), js(r.Keys), js(r.Skipped), js(r.Notes)); err != nil {
		return fmt.Errorf("save run %s: %w", r.ID, err)
	}
	st, err := tx.Prepare(`INSERT INTO samples VALUES (?,?,?,?,?,?,?,?)`)
	if err != nil {
		return err
	}
	defer st.Close()
	for _, x := range r.Samples {
		if _, err := st.Exec(r.ID, js(x.Config), x.Metric, x.Unit, x.Better, x.Mark, x.Rep, x.Value); err != nil {
			return fmt.Errorf("save run %s: %w", r.ID, err)
		}
	}
	return tx.Commit()
}

// RunInfo is one line of List.
type RunInfo struct {
	ID, Scenario string
	Started      time.Time
	Elapsed      float64
	Params       map[string]string
	Kernel       string
	Samples      int
}

// List returns the stored runs, newest first.
func (s *Store) List() ([]RunInfo, error) {
	rows, err := s.db.Query(`SELECT r.id, r.scenario, r.started, r.elapsed, r.params, r.env,
		(SELECT COUNT(*) FROM samples WHERE run_id = r.id) FROM runs r ORDER BY r.started DESC`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []RunInfo
	for rows.Next() {
		var ri RunInfo
		var started, params, env string
		if err := rows.Scan(&ri.ID, &ri.Scenario, &started, &ri.Elapsed, &params, &env, &ri.Samples); err != nil {
			return nil, err
		}
		ri.Started, _ = time.Parse(time.RFC3339Nano, started)
		json.Unmarshal([]byte(params), &ri.Params)
		var e bench.Env
		json.Unmarshal([]byte(env), &e)
		ri.Kernel = e.KernelRelease()
		out = append(out, ri)
	}
	return out, rows.Err()
}

// ErrNoRun is returned when no stored run matches an id.
var ErrNoRun = errors.New("no such run")

// Load returns the run whose id is id or starts with it (unambiguously).
func (s *Store) Load(id string) (*bench.Run, error) {
	rows, err := s.db.Query(`SELECT id, scenario, started, elapsed, params, env, keys, skipped, notes FROM runs WHERE id LIKE ? || '%'`, id)
	if err != nil {
		return nil, err
	}
	var runs []*bench.Run
	for rows.Next() {
		r := &bench.Run{}
		var started, params, env, keys, skipped, notes string
		if err := rows.Scan(&r.ID, &r.Scenario, &started, &r.Elapsed, &params, &env, &keys, &skipped, &notes); err != nil {
			rows.Close()
			return nil, err
		}
		r.Started, _ = time.Parse(time.RFC3339Nano, started)
		json.Unmarshal([]byte(params), &r.Params)
		json.Unmarshal([]byte(env), &r.Env)
		json.Unmarshal([]byte(keys), &r.Keys)
		json.Unmarshal([]byte(skipped), &r.Skipped)
		json.Unmarshal([]byte(notes), &r.Notes)
		runs = append(runs, r)
	}
	rows.Close()
	switch len(runs) {
	case 0:
		return nil, fmt.Errorf("%w %q in %s", ErrNoRun, id, s.Path)
	case 1:
	default:
		var ids []string
		for _, r := range runs {
			ids = append(ids, r.ID)
		}
		return nil, fmt.Errorf("run id %q is ambiguous: %s", id, strings.Join(ids, ", "))
	}
	r := runs[0]
	srows, err := s.db.Query(`SELECT config, metric, unit, better, mark, rep, value FROM samples WHERE run_id = ? ORDER BY rowid`, r.ID)
	if err != nil {
		return nil, err
	}
	defer srows.Close()
	for srows.Next() {
		var x bench.Sample
		var cfg string
		if err := srows.Scan(&cfg, &x.Metric, &x.Unit, &x.Better, &x.Mark, &x.Rep, &x.Value); err != nil {
			return nil, err
		}
		json.Unmarshal([]byte(cfg), &x.Config)
		r.Samples = append(r.Samples, x)
	}
	return r, srows.Err()
}

// LoadAny loads a run from a JSON file (as -o json writes) if ref names a
// file, else from the store by id.
func LoadAny(s *Store, ref string) (*bench.Run, error) {
	if fi, err := os.Stat(ref); err == nil && !fi.IsDir() {
		return bench.ReadJSON(ref)
	}
	if s == nil {
		return nil, fmt.Errorf("%w %q", ErrNoRun, ref)
	}
	return s.Load(ref)
}
