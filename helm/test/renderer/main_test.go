package main

// The Helm behaviours the chart relies on, checked on a small chart written here.

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeChart(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	base := map[string]string{
		"Chart.yaml":  "apiVersion: v2\nname: demo\nversion: 1.2.3\nappVersion: \"4.5\"\nkubeVersion: \">=1.25.0-0\"\n",
		"values.yaml": "a:\n  b: 1\n  c: keep\nbig: 1000000\nfrac: 0.25\nlist: [x, z]\nflag: yes\n",
	}
	for k, v := range files {
		base[k] = v
	}
	for name, text := range base {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func renderOne(t *testing.T, tpl string, userValues string, apis []string, strict bool) (string, error) {
	t.Helper()
	dir := writeChart(t, map[string]string{
		"templates/_helpers.tpl": `{{- define "demo.name" -}}{{ .Chart.Name }}-{{ .Release.Name }}{{- end -}}`,
		"templates/cm.yaml":      tpl,
	})
	var files []string
	if userValues != "" {
		f := filepath.Join(dir, "user.yaml")
		if err := os.WriteFile(f, []byte(userValues), 0o644); err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	out, _, _, err := render(dir, files, "rel", "ns", "1.29.0", apis, false, strict)
	return out, err
}

const head = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ include \"demo.name\" . }}\ndata:\n"

func TestValuesAndBuiltins(t *testing.T) {
	out, err := renderOne(t, head+
		`  b: {{ .Values.a.b | quote }}
  c: {{ hasKey .Values.a "c" }}
  d: {{ .Values.a.d | quote }}
  big: {{ .Values.big | quote }}
  kind: {{ kindOf .Values.big }}
  frac: {{ .Values.frac | quote }}
  flag: {{ .Values.flag | quote }}
  chart: {{ .Chart.Name }}-{{ .Chart.Version }}-{{ .Chart.AppVersion }}
  release: {{ .Release.Name }}-{{ .Release.Namespace }}-{{ .Release.Service }}-{{ .Release.IsInstall }}
  kube: {{ .Capabilities.KubeVersion.Version }}-{{ .Capabilities.KubeVersion.Minor }}
  apps: {{ .Capabilities.APIVersions.Has "apps/v1" | quote }}
  mon: {{ .Capabilities.APIVersions.Has "monitoring.coreos.com/v1" | quote }}
  tpl: {{ tpl "{{ .Release.Name }}-x" . }}
  tmpl: {{ .Template.Name }}
  list: {{ .Values.list | toYaml | nindent 4 }}
  json: {{ toJson .Values.a | quote }}
  yaml: {{ (fromYaml "k: v").k }}
`, "a:\n  b: 2\n  c: null\n  d: new\n", []string{"monitoring.coreos.com/v1"}, false)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`b: "2"`, `c: false`, `d: "new"`, // a user value wins; null deletes the default
		`big: "1e+06"`, `kind: float64`, // numbers are float64, as in Helm
		`frac: "0.25"`, `flag: "true"`, // YAML 1.1: yes is a boolean
		"chart: demo-1.2.3-4.5", "release: rel-ns-Helm-true", "kube: v1.29.0-29",
		`apps: "true"`, `mon: "true"`, "tpl: rel-x", "tmpl: demo/templates/cm.yaml",
		"list: \n    - x\n    - z", `json: "{\"b\":2,\"d\":\"new\"}"`, "yaml: v",
		"# Source: demo/templates/cm.yaml", "name: demo-rel",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in\n%s", want, out)
		}
	}
}

func TestToYamlLikeHelm(t *testing.T) {
	got := toYAML(map[string]any{"z": 1.0, "a": []any{"x", map[string]any{"k": 0.5}}, "m": map[string]any{}})
	want := "a:\n- x\n- k: 0.5\nm: {}\nz: 1"
	if got != want {
		t.Errorf("toYaml:\n%s\nwant:\n%s", got, want)
	}
}

func TestRequiredFailAndStrict(t *testing.T) {
	if _, err := renderOne(t, head+`  x: {{ required "x is required" .Values.nope }}`, "", nil, false); err == nil ||
		!strings.Contains(err.Error(), "x is required") {
		t.Errorf("required: %v", err)
	}
	if _, err := renderOne(t, head+`  x: {{ fail "no way" }}`, "", nil, false); err == nil ||
		!strings.Contains(err.Error(), "no way") {
		t.Errorf("fail: %v", err)
	}
	if out, err := renderOne(t, head+`  x: "{{ .Values.missing }}"`, "", nil, false); err != nil ||
		!strings.Contains(out, `x: ""`) {
		t.Errorf("missing value, not strict: %v\n%s", err, out)
	}
	if _, err := renderOne(t, head+`  x: "{{ .Values.missing }}"`, "", nil, true); err == nil {
		t.Error("missing value, strict: no error")
	}
	if _, err := renderOne(t, head+"  x: [unclosed\n", "", nil, false); err == nil {
		t.Error("a YAML error in a rendered document is not reported")
	}
	if _, err := renderOne(t, "{{ if false }}x{{ end }}\n---\n# only a comment\n", "", nil, false); err != nil {
		t.Errorf("empty documents: %v", err)
	}
}

func TestKubeVersionConstraint(t *testing.T) {
	dir := writeChart(t, map[string]string{"templates/x.yaml": ""})
	if _, _, _, err := render(dir, nil, "r", "n", "1.24.0", nil, false, false); err == nil ||
		!strings.Contains(err.Error(), "incompatible") {
		t.Errorf("kubeVersion: %v", err)
	}
}
