{{- define "dualpods.serviceAccountName" -}}
{{ .Release.Name }}-fma-controllers
{{- end -}}

{{- define "dualpods.requesterServiceAccountName" -}}
{{ .Release.Name }}-requester
{{- end -}}

{{- define "dualpods.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The Secret holding the bearer token launchers require (E9); empty when tokens are off. */}}
{{- define "dualpods.launcherTokenSecret" -}}
{{- if .Values.launcherToken.enabled -}}
{{ .Values.launcherToken.existingSecret | default (printf "%s-launcher-token" .Release.Name) }}
{{- end -}}
{{- end -}}

{{- define "dualpods.labels" -}}
app.kubernetes.io/name: dualpods
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* A controller Deployment; call with (dict "root" $ "name" ... "command" ... "values" ... "args" ...). */}}
{{- define "dualpods.controller" -}}
{{- $root := .root -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ $root.Release.Name }}-{{ .name }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "dualpods.labels" $root | nindent 4 }}
    app.kubernetes.io/component: {{ .name }}
spec:
  replicas: {{ .values.replicas }}
  selector:
    matchLabels:
      app.kubernetes.io/instance: {{ $root.Release.Name }}
      app.kubernetes.io/component: {{ .name }}
  template:
    metadata:
      labels:
        {{- include "dualpods.labels" $root | nindent 8 }}
        app.kubernetes.io/component: {{ .name }}
    spec:
      serviceAccountName: {{ include "dualpods.serviceAccountName" $root }}
      terminationGracePeriodSeconds: 10
      containers:
        - name: controller
          image: {{ include "dualpods.image" $root }}
          imagePullPolicy: {{ $root.Values.image.pullPolicy }}
          args:
            - {{ .command }}
            - --namespace=$(NAMESPACE)
            - --metrics-host=$(POD_IP)
            - --metrics-port={{ .values.metricsPort }}
            - --log-level={{ .values.logLevel }}
            - --num-workers={{ .values.workers }}
            - --kube-api-qps={{ .values.kubeApiQps }}
            - --kube-api-burst={{ .values.kubeApiBurst }}
            {{- if gt (int .values.replicas) 1 }}
            - --leader-elect
            {{- end }}
            {{- $secret := include "dualpods.launcherTokenSecret" $root }}
            {{- if $secret }}
            # Both controllers must build identical launcher Pods, token volume included.
            - --launcher-token-secret={{ $secret }}
            {{- if .mountToken }}
            - --launcher-token-file=/var/run/secrets/dualpods/launcher-token/token
            {{- end }}
            {{- end }}
            {{- range .args }}
            - {{ . }}
            {{- end }}
          env:
            - name: NAMESPACE
              valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
            - name: POD_IP
              valueFrom: {fieldRef: {fieldPath: status.podIP}}
            - name: POD_NAME
              valueFrom: {fieldRef: {fieldPath: metadata.name}}
            # Requester tokens (E15) are bound to this Pod: they die with it.
            - name: POD_UID
              valueFrom: {fieldRef: {fieldPath: metadata.uid}}
          ports:
            - {name: metrics, containerPort: {{ .values.metricsPort }}}
          readinessProbe:
            httpGet: {path: /healthz, port: metrics}
            periodSeconds: 5
          livenessProbe:
            httpGet: {path: /healthz, port: metrics}
            periodSeconds: 20
          resources:
            {{- toYaml .values.resources | nindent 12 }}
          {{- if and $secret .mountToken }}
          volumeMounts:
            - {name: launcher-token, mountPath: /var/run/secrets/dualpods/launcher-token, readOnly: true}
      volumes:
        - name: launcher-token
          secret: {secretName: {{ $secret }}}
          {{- end }}
{{- end -}}
