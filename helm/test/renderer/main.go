// helm-render: renders a Helm chart offline, the way `helm template` does, with Go's
// text/template and the sprig function library (the engine Helm uses). Built from Debian's
// golang-go and golang-github-masterminds-sprig-dev by helm/test/check.sh; no network.
//
//	helm-render --chart DIR [-f values.yaml]... [--release NAME] [--namespace NS]
//	            [--kube-version 1.29.0] [--api-versions monitoring.coreos.com/v1,...]
//	            [--upgrade] [--strict] [--values-out FILE] [--notes-out FILE] [--values-only]
//
// Prints the manifests on stdout as "---\n# Source: CHART/templates/FILE\n<document>".
// Supported: .Values (chart defaults coalesced with -f files in order, deep merge, null
// deletes a default), .Release, .Chart, .Capabilities (KubeVersion, APIVersions.Has),
// .Template, include, tpl, required, toYaml, fromYaml, fromYamlArray, toJson, fromJson,
// fromJsonArray, lookup (always empty, as in `helm template`), Chart.yaml's kubeVersion.
// Not supported: subcharts, .Files, toToml, values.schema.json (check.sh validates values
// separately), hooks (rendered like any manifest).
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"text/template"

	"github.com/Masterminds/semver/v3"
	"github.com/Masterminds/sprig/v3"
	yaml "gopkg.in/yaml.v2"
)

// Metadata is Chart.yaml, with the field names templates use (.Chart.Name, .Chart.AppVersion).
type Metadata struct {
	APIVersion   string            `yaml:"apiVersion"`
	Name         string            `yaml:"name"`
	Version      string            `yaml:"version"`
	KubeVersion  string            `yaml:"kubeVersion"`
	Description  string            `yaml:"description"`
	Type         string            `yaml:"type"`
	Keywords     []string          `yaml:"keywords"`
	Home         string            `yaml:"home"`
	Sources      []string          `yaml:"sources"`
	Maintainers  []map[string]any  `yaml:"maintainers"`
	Icon         string            `yaml:"icon"`
	AppVersion   string            `yaml:"appVersion"`
	Deprecated   bool              `yaml:"deprecated"`
	Annotations  map[string]string `yaml:"annotations"`
	Dependencies []map[string]any  `yaml:"dependencies"`
}

// VersionSet is .Capabilities.APIVersions: "group/version" and "group/version/Kind" entries.
type VersionSet []string

func (v VersionSet) Has(s string) bool {
	for _, x := range v {
		if x == s {
			return true
		}
	}
	return false
}

type KubeVersion struct{ Version, Major, Minor, GitVersion string }

func (k KubeVersion) String() string { return k.Version }

type Capabilities struct {
	KubeVersion KubeVersion
	APIVersions VersionSet
	HelmVersion map[string]string
}

// The group versions a plain cluster serves (what `helm template` assumes without a cluster).
var builtinAPIVersions = []string{
	"v1", "admissionregistration.k8s.io/v1", "apiextensions.k8s.io/v1",
	"apiregistration.k8s.io/v1", "apps/v1", "authentication.k8s.io/v1",
	"authorization.k8s.io/v1", "autoscaling/v1", "autoscaling/v2", "batch/v1",
	"certificates.k8s.io/v1", "coordination.k8s.io/v1", "discovery.k8s.io/v1",
	"events.k8s.io/v1", "flowcontrol.apiserver.k8s.io/v1", "networking.k8s.io/v1",
	"node.k8s.io/v1", "policy/v1", "rbac.authorization.k8s.io/v1", "scheduling.k8s.io/v1",
	"storage.k8s.io/v1",
}

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(s string) error { *l = append(*l, s); return nil }

func main() {
	var valueFiles, apiVersions listFlag
	chartDir := flag.String("chart", "", "chart directory")
	release := flag.String("release", "recall", "release name")
	namespace := flag.String("namespace", "default", "release namespace")
	kubeVersion := flag.String("kube-version", "1.29.0", "Kubernetes version for .Capabilities")
	upgrade := flag.Bool("upgrade", false, ".Release.IsUpgrade instead of IsInstall")
	strict := flag.Bool("strict", false, "fail on a reference to a missing value (helm lint --strict)")
	valuesOut := flag.String("values-out", "", "write the merged values here as JSON")
	notesOut := flag.String("notes-out", "", "write the rendered NOTES.txt here")
	valuesOnly := flag.Bool("values-only", false, "only merge the values (for --values-out)")
	flag.Var(&valueFiles, "f", "values file (repeatable; later files win)")
	flag.Var(&apiVersions, "api-versions", "extra API versions for .Capabilities (comma separated, repeatable)")
	flag.Parse()
	if *chartDir == "" || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: helm-render --chart DIR [-f values.yaml]... (see the source for flags)")
		os.Exit(2)
	}
	extra := []string{}
	for _, a := range apiVersions {
		for _, s := range strings.Split(a, ",") {
			if s = strings.TrimSpace(s); s != "" {
				extra = append(extra, s)
			}
		}
	}
	if *valuesOnly {
		values, err := loadValues(*chartDir, valueFiles)
		if err == nil {
			err = writeJSON(*valuesOut, values)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "Error: %v\n", err)
			os.Exit(1)
		}
		return
	}
	out, notes, values, err := render(*chartDir, valueFiles, *release, *namespace, *kubeVersion,
		extra, *upgrade, *strict)
	if err != nil {
		fmt.Fprintf(os.Stderr, "Error: %v\n", err)
		os.Exit(1)
	}
	if *valuesOut != "" {
		if err := writeJSON(*valuesOut, values); err != nil {
			fmt.Fprintf(os.Stderr, "Error: %v\n", err)
			os.Exit(1)
		}
	}
	if *notesOut != "" {
		if err := os.WriteFile(*notesOut, []byte(notes), 0o644); err != nil {
			fmt.Fprintf(os.Stderr, "Error: %v\n", err)
			os.Exit(1)
		}
	}
	os.Stdout.WriteString(out)
}

func writeJSON(file string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(file, append(b, '\n'), 0o644)
}

func render(chartDir string, valueFiles []string, releaseName, namespace, kubeVersion string,
	extraAPIs []string, upgrade, strict bool) (string, string, map[string]any, error) {
	meta, err := loadChart(chartDir)
	if err != nil {
		return "", "", nil, err
	}
	kv, err := semver.NewVersion(kubeVersion)
	if err != nil {
		return "", "", nil, fmt.Errorf("--kube-version %q: %v", kubeVersion, err)
	}
	if meta.KubeVersion != "" {
		c, err := semver.NewConstraint(meta.KubeVersion)
		if err != nil {
			return "", "", nil, fmt.Errorf("Chart.yaml kubeVersion %q: %v", meta.KubeVersion, err)
		}
		if !c.Check(kv) {
			return "", "", nil, fmt.Errorf("chart requires kubeVersion: %s which is incompatible with Kubernetes v%s",
				meta.KubeVersion, kv)
		}
	}
	values, err := loadValues(chartDir, valueFiles)
	if err != nil {
		return "", "", nil, err
	}
	caps := Capabilities{
		KubeVersion: KubeVersion{Version: "v" + kv.String(), Major: fmt.Sprint(kv.Major()),
			Minor: fmt.Sprint(kv.Minor()), GitVersion: "v" + kv.String()},
		APIVersions: append(VersionSet{}, append(builtinAPIVersions, extraAPIs...)...),
		HelmVersion: map[string]string{"Version": "v3-offline-renderer"},
	}
	top := map[string]any{
		"Values": values,
		"Chart":  meta,
		"Release": map[string]any{
			"Name": releaseName, "Namespace": namespace, "Service": "Helm",
			"IsInstall": !upgrade, "IsUpgrade": upgrade, "Revision": 1,
		},
		"Capabilities": caps,
		"Files":        map[string]any{},
	}

	// Every file under templates/ is parsed into one set (named CHART/templates/PATH), so any
	// of them can include the others' definitions; files whose name starts with "_" are not
	// rendered.
	base := path.Join(meta.Name, "templates")
	var names []string
	sources := map[string]string{}
	root := filepath.Join(chartDir, "templates")
	err = filepath.Walk(root, func(p string, info os.FileInfo, err error) error {
		if err != nil || info.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		name := path.Join(base, filepath.ToSlash(rel))
		names = append(names, name)
		sources[name] = string(b)
		return nil
	})
	if err != nil {
		return "", "", nil, err
	}
	sort.Strings(names)

	t := template.New("gotpl")
	if strict {
		t.Option("missingkey=error")
	} else {
		t.Option("missingkey=zero")
	}
	t.Funcs(funcMap(t, strict))
	for _, n := range names {
		if _, err := t.New(n).Parse(sources[n]); err != nil {
			return "", "", nil, fmt.Errorf("parse error: %v", err)
		}
	}

	var out, notes strings.Builder
	for _, n := range names {
		if strings.HasPrefix(path.Base(n), "_") {
			continue
		}
		data := map[string]any{}
		for k, v := range top {
			data[k] = v
		}
		data["Template"] = map[string]any{"Name": n, "BasePath": base}
		var buf strings.Builder
		if err := t.ExecuteTemplate(&buf, n, data); err != nil {
			return "", "", nil, fmt.Errorf("execution error: %v", err)
		}
		text := strings.ReplaceAll(buf.String(), "<no value>", "")
		if path.Base(n) == "NOTES.txt" {
			notes.WriteString(strings.TrimSpace(text) + "\n")
			continue
		}
		for _, doc := range splitDocuments(text) {
			if err := checkHead(n, doc); err != nil {
				return "", "", nil, err
			}
			fmt.Fprintf(&out, "---\n# Source: %s\n%s\n", n, strings.TrimSpace(doc))
		}
	}
	return out.String(), notes.String(), values, nil
}

// splitDocuments splits a rendered file on "---" lines and drops empty documents.
func splitDocuments(s string) []string {
	var docs []string
	var cur []string
	flush := func() {
		doc := strings.Join(cur, "\n")
		empty := true
		for _, l := range cur {
			if t := strings.TrimSpace(l); t != "" && !strings.HasPrefix(t, "#") {
				empty = false
				break
			}
		}
		if !empty {
			docs = append(docs, doc)
		}
		cur = nil
	}
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, "---") && strings.TrimSpace(strings.TrimPrefix(l, "---")) == "" {
			flush()
			continue
		}
		cur = append(cur, l)
	}
	flush()
	return docs
}

// checkHead fails, as Helm does, on a document that is not YAML or has no kind.
func checkHead(name, doc string) error {
	var head struct {
		APIVersion string `yaml:"apiVersion"`
		Kind       string `yaml:"kind"`
		Metadata   struct {
			Name string `yaml:"name"`
		} `yaml:"metadata"`
	}
	if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
		return fmt.Errorf("YAML parse error on %s: %v", name, err)
	}
	if head.APIVersion == "" || head.Kind == "" || head.Metadata.Name == "" {
		return fmt.Errorf("%s: a document lacks apiVersion, kind or metadata.name", name)
	}
	return nil
}

func loadChart(dir string) (*Metadata, error) {
	b, err := os.ReadFile(filepath.Join(dir, "Chart.yaml"))
	if err != nil {
		return nil, err
	}
	m := &Metadata{}
	if err := yaml.UnmarshalStrict(b, m); err != nil {
		return nil, fmt.Errorf("Chart.yaml: %v", err)
	}
	if m.APIVersion != "v2" || m.Name == "" || m.Version == "" {
		return nil, errors.New("Chart.yaml: needs apiVersion: v2, name and version")
	}
	if _, err := semver.StrictNewVersion(m.Version); err != nil {
		return nil, fmt.Errorf("Chart.yaml: version %q is not SemVer 2: %v", m.Version, err)
	}
	return m, nil
}

// readYAML reads a values file as Helm does (YAML 1.1 through JSON): maps have string keys
// and every number is a float64, so templates meet the same types as under Helm.
func readYAML(file string) (map[string]any, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var raw any
	if err := yaml.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("%s: %v", file, err)
	}
	if raw == nil {
		return map[string]any{}, nil
	}
	j, err := json.Marshal(stringKeys(raw))
	if err != nil {
		return nil, fmt.Errorf("%s: %v", file, err)
	}
	m := map[string]any{}
	if err := json.Unmarshal(j, &m); err != nil {
		return nil, fmt.Errorf("%s: not a map at the top: %v", file, err)
	}
	return m, nil
}

func stringKeys(v any) any {
	switch x := v.(type) {
	case map[any]any:
		m := map[string]any{}
		for k, e := range x {
			m[fmt.Sprint(k)] = stringKeys(e)
		}
		return m
	case []any:
		for i := range x {
			x[i] = stringKeys(x[i])
		}
	}
	return v
}

func loadValues(chartDir string, files []string) (map[string]any, error) {
	defaults, err := readYAML(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		return nil, err
	}
	user := map[string]any{}
	for _, f := range files {
		m, err := readYAML(f)
		if err != nil {
			return nil, err
		}
		user = mergeMaps(user, m)
	}
	return coalesce(user, defaults), nil
}

// mergeMaps merges b over a (user files among themselves; nulls are kept for coalesce).
func mergeMaps(a, b map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		if bm, ok := v.(map[string]any); ok {
			if am, ok := out[k].(map[string]any); ok {
				out[k] = mergeMaps(am, bm)
				continue
			}
		}
		out[k] = v
	}
	return out
}

// coalesce lays user values over the chart defaults: maps merge deeply, any other user value
// replaces the default, and a user null removes the key.
func coalesce(user, defaults map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range defaults {
		out[k] = v
	}
	for k, v := range user {
		if v == nil {
			delete(out, k)
			continue
		}
		um, uok := v.(map[string]any)
		dm, dok := out[k].(map[string]any)
		if uok && dok {
			out[k] = coalesce(um, dm)
		} else if uok {
			out[k] = coalesce(um, map[string]any{})
		} else {
			if dok {
				fmt.Fprintf(os.Stderr, "warning: %s: a table in the defaults is overwritten by a non-table value\n", k)
			}
			out[k] = v
		}
	}
	return out
}

func funcMap(t *template.Template, strict bool) template.FuncMap {
	f := sprig.TxtFuncMap()
	delete(f, "env") // Helm removes these two: a chart must not read the environment
	delete(f, "expandenv")
	depth := map[string]int{}
	f["include"] = func(name string, data any) (string, error) {
		if depth[name] > 1000 {
			return "", fmt.Errorf("include %q: nested too deeply", name)
		}
		depth[name]++
		defer func() { depth[name]-- }()
		var buf strings.Builder
		err := t.ExecuteTemplate(&buf, name, data)
		return buf.String(), err
	}
	f["tpl"] = func(text string, data any) (string, error) {
		c, err := t.Clone()
		if err != nil {
			return "", err
		}
		name := "tpl"
		if m, ok := data.(map[string]any); ok {
			if tm, ok := m["Template"].(map[string]any); ok {
				name = fmt.Sprint(tm["Name"])
			}
		}
		c.Funcs(funcMap(c, strict))
		if _, err := c.New(name).Parse(text); err != nil {
			return "", fmt.Errorf("tpl %q: %v", text, err)
		}
		var buf strings.Builder
		if err := c.ExecuteTemplate(&buf, name, data); err != nil {
			return "", fmt.Errorf("tpl %q: %v", text, err)
		}
		return strings.ReplaceAll(buf.String(), "<no value>", ""), nil
	}
	f["required"] = func(msg string, v any) (any, error) {
		if v == nil {
			return v, errors.New(msg)
		}
		if s, ok := v.(string); ok && s == "" {
			return v, errors.New(msg)
		}
		return v, nil
	}
	f["lookup"] = func(apiVersion, kind, namespace, name string) (map[string]any, error) {
		return map[string]any{}, nil // `helm template` has no cluster either
	}
	f["toYaml"] = toYAML
	f["fromYaml"] = func(s string) map[string]any {
		m := map[string]any{}
		if err := yamlToJSONValue(s, &m); err != nil {
			m["Error"] = err.Error()
		}
		return m
	}
	f["fromYamlArray"] = func(s string) []any {
		a := []any{}
		if err := yamlToJSONValue(s, &a); err != nil {
			a = []any{err.Error()}
		}
		return a
	}
	f["toJson"] = func(v any) string {
		b, err := json.Marshal(v)
		if err != nil {
			return ""
		}
		return string(b)
	}
	f["fromJson"] = func(s string) map[string]any {
		m := map[string]any{}
		if err := json.Unmarshal([]byte(s), &m); err != nil {
			m["Error"] = err.Error()
		}
		return m
	}
	f["fromJsonArray"] = func(s string) []any {
		a := []any{}
		if err := json.Unmarshal([]byte(s), &a); err != nil {
			a = []any{err.Error()}
		}
		return a
	}
	return f
}

// toYAML marshals through JSON, then YAML with sorted keys, 2-space indentation and
// unindented sequences, as Helm's toYaml (sigs.k8s.io/yaml) does; errors give "".
func toYAML(v any) string {
	j, err := json.Marshal(v)
	if err != nil {
		return ""
	}
	var ms yaml.MapSlice
	var doc any = &ms
	if len(j) > 0 && j[0] != '{' {
		var x any
		doc = &x
	}
	if err := yaml.Unmarshal(j, doc); err != nil {
		return ""
	}
	b, err := yaml.Marshal(doc)
	if err != nil {
		return ""
	}
	return strings.TrimSuffix(string(b), "\n")
}

func yamlToJSONValue(s string, out any) error {
	var raw any
	if err := yaml.Unmarshal([]byte(s), &raw); err != nil {
		return err
	}
	j, err := json.Marshal(stringKeys(raw))
	if err != nil {
		return err
	}
	return json.Unmarshal(bytes.TrimSpace(j), out)
}
